"""Upload the binaries and scripts that ``subprocess`` tasks run."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from tasks_app.artifacts import artifact_create, artifact_delete
from tasks_app.models import Artifact
from tms_core.auth import request_user
from tms_project.api.base import OwnerScopedMixin
from tms_project.api.schema import error_responses


class ArtifactSerializer(serializers.ModelSerializer):
    class Meta:
        model = Artifact
        fields = ["id", "name", "sha256", "size", "created_at"]
        read_only_fields = fields


class ArtifactUploadSerializer(serializers.Serializer):
    file = serializers.FileField()
    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)


class ArtifactViewSet(
    OwnerScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Uploaded artifacts: stored with their SHA-256, verified before every run."""

    queryset = Artifact.objects.all()
    serializer_class = ArtifactSerializer
    parser_classes = [MultiPartParser, FormParser]

    @extend_schema(request={"multipart/form-data": ArtifactUploadSerializer}, responses={201: ArtifactSerializer})
    def create(self, request: Request) -> Response:
        upload = ArtifactUploadSerializer(data=request.data)
        upload.is_valid(raise_exception=True)
        artifact = artifact_create(owner=request_user(request), upload=upload.validated_data["file"],
                                   name=upload.validated_data["name"])  # fmt: skip
        return Response(ArtifactSerializer(artifact).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None, **error_responses(409)})
    def destroy(self, request: Request, *args: object, **kwargs: object) -> Response:
        return super().destroy(request, *args, **kwargs)

    def perform_destroy(self, instance: Artifact) -> None:
        artifact_delete(artifact=instance)
