"""Operator commands around the daemon (``magi-code daemon start|stop|status|install``).

They sit above both the daemon and the client: ``start``/``stop``/``status`` talk to a
daemon through :mod:`magi_code.client`, ``run`` enters :mod:`magi_code.daemon`.
"""
