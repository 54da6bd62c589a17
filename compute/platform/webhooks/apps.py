from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "compute.platform.webhooks"
    label = "webhooks"
    verbose_name = "Webhooks: events delivered to the URLs tenants subscribe"
