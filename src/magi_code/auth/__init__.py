"""Shared provider authentication: the protected store, readiness, credentials and login.

Layering: this domain sits above ``storage`` and ``protocol`` only. The coordinator wires
the wire routes (``auth.status``, ``auth.login.*``, ``auth.logout``) onto these modules.
"""
