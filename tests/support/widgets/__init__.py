"""A small app of its own: its event type, its role grant and its API method live here and
nowhere else (tests/test_vocabulary.py loads it beside the real apps)."""
