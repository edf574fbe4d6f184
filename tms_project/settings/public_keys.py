"""The keys of the test settings: public (they are in this repository), so production refuses
them (``base.PUBLIC_KEYS``). Their own module, holding nothing else, so that ``test.py`` can
set them as defaults before ``base`` reads the environment."""

#: The suite's DJANGO_SECRET_KEY.
TEST_SECRET_KEY = "test-only-key-9f2c7e1b4a6d8035c1e7f9a2b4d6e8f0a1c3e5f7b9d1f3a5"  # noqa: S105 - public on purpose
#: The suite's TMS_SECRET_KEYS (a Fernet key).
TEST_SECRETS_KEY = "dGVzdC1vbmx5LXRtcy1zZWNyZXRzLWtleS0zMmJ5dGU="
