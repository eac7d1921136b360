.PHONY: setup serve test

setup:
	bash scripts/setup.sh

serve: setup
	exec .venv/bin/jetlake serve --warehouse ./warehouse

test: setup
	.venv/bin/python scripts/test.py $(PYTEST_ARGS)
