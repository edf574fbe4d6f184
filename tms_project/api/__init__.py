"""The ``/api/v1/`` routes (``urls``); the API's shared plumbing is :mod:`tms_core.api`."""
