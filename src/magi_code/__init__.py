"""magi-code application service."""
