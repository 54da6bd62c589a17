# The few commands a contributor runs (see docs/development/contributing.md).
.PHONY: dev test lint docs serve-docs

dev:
	better-compute dev --memory --sim 8

test:
	python -m pytest

lint:
	ruff check .
	lint-imports
	mypy .

docs:
	python -m scripts.reference
	mkdocs build --strict

serve-docs:
	mkdocs serve
