import sys

from magi_code.cli import main

sys.exit(main())
