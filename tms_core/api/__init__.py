"""The REST API's shared plumbing, below every app's views and serializers.

``base`` (view and serializer mixins, bounded date-times, pagination), ``auth`` (the
authentication classes), ``conf`` (the ``TMS_API`` settings), ``errors`` (the one error shape),
``keyset`` (cursor pages), ``parsers`` (the JSON parser) and ``schema`` (the OpenAPI schema's
generic extensions). The routes are the top's: ``tms_project/api/urls.py``. Deliberately empty of
imports: ``tms_core.api.conf`` must stay cheap to import for services.
"""
