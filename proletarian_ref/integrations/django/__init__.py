"""Django 6 tasks on Proletarian: ProletarianBackend and the proletarian_worker command (docs/django.md)."""

from proletarian_ref.integrations.django.backend import ProletarianBackend

__all__ = ["ProletarianBackend"]
