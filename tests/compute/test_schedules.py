"""Every scheduled job resolves to a callable, and installing them is idempotent."""

from django.utils.module_loading import import_string
from django_q.models import Schedule

from audit.models import Checkpoint
from compute.platform.schedules import SCHEDULES, install_schedules


def test_every_dotted_path_resolves():
    for fields in SCHEDULES.values():
        assert callable(import_string(fields["func"]))


def test_install_is_idempotent(db):
    assert install_schedules() == len(SCHEDULES)
    install_schedules()
    assert Schedule.objects.count() == len(SCHEDULES)


def test_the_hourly_checkpoint_task_seals_new_events(root):
    from audit.tasks import checkpoint_all_task

    root("sites.create", kind="shared", region="eu-1")
    assert checkpoint_all_task() >= 1
    assert Checkpoint.objects.exists()
    assert checkpoint_all_task() == 0  # nothing new
