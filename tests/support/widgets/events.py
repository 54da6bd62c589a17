from compute.platform.events.types import EventType, event_types


@event_types
class WidgetEvent(EventType):
    WIDGET_MADE = "widget.made"
