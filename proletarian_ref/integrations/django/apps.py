"""The Django app that brings the proletarian_worker management command."""

from django.apps import AppConfig


class ProletarianConfig(AppConfig):
    name = "proletarian_ref.integrations.django"
    label = "proletarian"
    verbose_name = "Proletarian"
