"""Tracing: turnfsm runs as OpenTelemetry spans, and reading them back."""
