"""Every scheduled job resolves to a callable, and installing them is idempotent."""

import pytest
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


@pytest.mark.django_db(transaction=True)  # (the jobs commit, as in a worker)
def test_a_worker_with_periodic_runs_the_due_schedules_itself_once_each(root):
    """`bc_worker --periodic` (dev's one worker): due schedules run in the worker, as the
    cluster would run them (their next run moved on, their results recorded)."""
    from datetime import timedelta

    from django.utils import timezone
    from django_q.models import OrmQ, Success

    from compute.platform.management.commands.bc_worker import PeriodicJobs

    root("sites.create", kind="shared", region="eu-1")  # audit rows to checkpoint
    install_schedules()
    now = timezone.now()
    Schedule.objects.update(next_run=now - timedelta(minutes=1))
    jobs = PeriodicJobs()
    jobs.run_due()
    assert Checkpoint.objects.exists()  # the hourly checkpoint ran, here
    assert sorted(Success.objects.values_list("func", flat=True)) == sorted(
        fields["func"] for fields in SCHEDULES.values())
    assert all(schedule.next_run > now for schedule in Schedule.objects.all())
    jobs.run_due()  # nothing is due now: nothing runs again
    assert Success.objects.count() == len(SCHEDULES)
    assert not OrmQ.objects.exists()  # every task taken off the broker was acknowledged
