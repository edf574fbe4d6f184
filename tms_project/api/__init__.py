"""The REST API's plumbing, shared by every app's views and serializers.

``base`` (view and serializer mixins, bounded date-times, pagination), ``conf`` (the ``TMS_API``
settings), ``errors`` (the one error shape), ``parsers`` (the JSON parser), ``schema`` (the
OpenAPI schema's extensions) and ``urls`` (the ``/api/v1/`` routes). Deliberately empty of
imports: ``tms_project.api.conf`` must stay cheap to import for services.
"""
