"""Faults of opgate's own infrastructure: its database, its process, its log sink."""
