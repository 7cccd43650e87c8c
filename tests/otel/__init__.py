"""Tests of spanpack.otel.  Every module here skips through
pytest.importorskip("opentelemetry.sdk") first (a failure under CI, where the
[test] extra installs the SDK), then imports tests.otel.spans."""
