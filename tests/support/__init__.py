"""Shared test support: loopback fakes speaking the real wire formats."""
