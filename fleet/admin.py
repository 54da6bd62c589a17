from django.contrib import admin

from fleet.models import Pool, Site


@admin.register(Site)
class SiteAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "kind", "region", "tenant", "created_at")
    list_filter = ("kind", "region")
    search_fields = ("id", "name", "region")


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "pool_class", "gpu_model", "site", "tenant")
    list_filter = ("pool_class", "gpu_model", "site")
    search_fields = ("id", "name", "gpu_model")
