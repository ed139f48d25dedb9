"""Clients of the three backing stores; each owns its schema and its one job."""
