from typing import Any

from audit.services import audit_record, audited
from compute.core.api.inputs import Input
from compute.core.api.registry import CallContext, endpoint
from compute.core.api.shapes import STRING, obj
from compute.platform.events.services import event_emit
from tests.support.widgets.events import WidgetEvent


@audited
def widget_make(*, tenant: Any, actor: Any) -> str:
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="widget.make", target="w1")
    event_emit(tenant_id=tenant.id, type=WidgetEvent.WIDGET_MADE, subject="w1")
    return "w1"


@endpoint("widgets", "make", returns=obj(id=STRING), input=Input, mutating=True,
          emits=(WidgetEvent.WIDGET_MADE,))
def widgets_make(ctx: CallContext, data: dict[str, Any]) -> dict[str, Any]:
    """Make a widget."""
    return {"id": widget_make(tenant=ctx.tenant, actor=ctx.principal)}
