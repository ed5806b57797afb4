"""Where a daemon and its clients meet: runtime paths, the lifetime lock, peer checks.

Both sides import this package; it imports neither of them.
"""
