"""The terminal commands: ``magi-code daemon …``, ``login``/``logout``/``auth status``,
``doctor`` and ``sessions list|show|rm``.

They sit above both the daemon and the client: ``start``/``stop``/``status`` talk to a
daemon through :mod:`magi_code.client`, ``run`` enters :mod:`magi_code.daemon`; the
others use the domains (auth, config, sessions) directly, as a service would.
"""

from typing import Final

# A command ended by Ctrl-C: 128 + SIGINT, as a shell reports it.
EXIT_INTERRUPTED: Final = 130
