"""GET /downloads/<name>: agent artifacts and sandbox image parts from the downloads folder
(BC_DOWNLOADS_DIR).

Artifacts are named like goreleaser's (`bcd_<version>_linux_<arch>`); the install script
pins each one's SHA-256, and nodes check each image part against the sha256 its image
names, so serving them over plain HTTP inside a network is safe.
"""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings
from django.http import FileResponse, Http404, HttpRequest

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


def download_view(request: HttpRequest, name: str) -> FileResponse:
    directory = settings.BC_DOWNLOADS_DIR
    if not directory or not SAFE_NAME.match(name):
        raise Http404("no such download")
    path = Path(directory) / name
    if not path.is_file():
        raise Http404("no such download")
    return FileResponse(path.open("rb"), as_attachment=True, filename=name)
