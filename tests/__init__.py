"""spanpack's test suite; shared helpers are in tests.support."""
