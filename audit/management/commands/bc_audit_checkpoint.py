"""Sign checkpoints over every tenant's new audit events (the hourly job, on demand)."""

from django.core.management.base import BaseCommand

from audit.checkpoints import checkpoint_seal_all


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args: object, **options: object) -> None:
        for checkpoint in checkpoint_seal_all():
            self.stdout.write(f"{checkpoint.tenant_id}: {checkpoint.tree_size} events, "
                              f"root {checkpoint.root_hash[:16]}…")
