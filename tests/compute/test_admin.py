"""The admin lists every model for a root operator, with search by id."""

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import User

PROJECT_APPS = ("compute", "audit", "fleet", "reservations", "webhooks")


def test_every_project_model_is_in_the_admin():
    missing = [m.__name__ for m in apps.get_models()
               if m._meta.app_label in PROJECT_APPS and m not in admin.site._registry]
    assert missing == []


@pytest.mark.parametrize("model", [m for m in apps.get_models()
                                   if m._meta.app_label in PROJECT_APPS])
def test_admin_changelist_renders_with_a_search(client, root, model):
    user = User.objects.create_superuser("ops", password="pw-123456789")
    client.force_login(user)
    url = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
    assert client.get(url).status_code == 200
    assert client.get(url, {"q": "tnt_"}).status_code == 200


def test_the_admin_is_styled_by_static_files_the_app_serves(client, db):
    response = client.get("/static/admin/css/base.css")
    assert response.status_code == 200
    assert b"body" in b"".join(response.streaming_content)


def test_model_names_read_as_english_plurals():
    plurals = {m._meta.verbose_name_plural for m in apps.get_models()
               if m._meta.app_label in PROJECT_APPS}
    assert "sandboxes" in plurals
    assert not [p for p in plurals if str(p).endswith(("xs", "ys"))]
