from django.apps import AppConfig


class ProjectConfig(AppConfig):
    name = "config"
    verbose_name = "Project"
