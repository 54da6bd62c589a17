from compute.project.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.widgets.apps.WidgetsConfig"]  # noqa: F405
