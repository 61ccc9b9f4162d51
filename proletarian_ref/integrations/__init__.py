"""Integrations with application frameworks: SQLAlchemy sessions and engines, Django's tasks framework."""
