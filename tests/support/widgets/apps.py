from django.apps import AppConfig


class WidgetsConfig(AppConfig):
    name = "tests.support.widgets"
    label = "widgets"
