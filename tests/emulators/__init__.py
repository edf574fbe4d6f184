"""Local emulations of external APIs the runners talk to, for tests.

Each emulator is a real HTTP server on 127.0.0.1 (an ephemeral port) speaking the subset of the
real wire protocol the official client libraries use, so the runners are tested through those
libraries unchanged. Emulators count what they were asked to launch, so tests can assert
"exactly one external run" on the executor's side rather than trusting the runner.
"""
