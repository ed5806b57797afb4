"""``python -m magi_code.daemon --ready-fd N``: the on-demand daemon, as the starter spawns it.

The same as ``magi-code daemon run --on-demand --ready-fd N`` without the command line's
parser (argparse and its parser cost a cold start ~7 ms) and without a stderr log handler
(its stderr is ``/dev/null``).
"""

import sys

from magi_code.daemon.lifecycle import run_daemon
from magi_code.storage.launch import LaunchContext

if sys.argv[1:2] != ["--ready-fd"] or len(sys.argv) != 3 or not sys.argv[2].isdigit():
    sys.stderr.write("usage: python -m magi_code.daemon --ready-fd N\n")
    sys.exit(2)
sys.exit(run_daemon(LaunchContext.from_process(), on_demand=True, ready_fd=int(sys.argv[2])))
