"""The fault test bed: real processes and a real PostgreSQL, opgate's own infrastructure failing."""
