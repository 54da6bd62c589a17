#!/usr/bin/env python
"""Django's command-line utility for better-compute."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "compute.project.settings")
    from compute.core.pg import NO_DATABASE, database_url, persistent

    if not database_url() and sys.argv[1:2] not in (["check"], ["help"], ["--help"], []):
        sys.stderr.write(f"manage.py: {NO_DATABASE.format(where=persistent().data_dir)}\n")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
