from fleet.reports import report_kind


def widget_report_record(*, node_id: str, body: str, signature: str) -> None:
    """What a node says of its widgets (signed): nothing to apply in the example."""


report_kind("widget", widget_report_record, refusal_action="widget.report")
