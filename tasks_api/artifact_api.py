"""Upload the binaries and scripts that ``subprocess`` tasks run."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tasks_app.artifacts import (
    artifact_create,
    artifact_delete,
    artifact_upload_begin,
    artifact_upload_complete,
    artifact_upload_receive,
)
from tasks_app.models import Artifact, ArtifactStatus
from teams_api.scope import TEAM_FILTER_HELP, TeamOwnedMixin, team_field
from tms_core.api.base import StrictInputMixin
from tms_core.api.schema import error_response, error_responses
from tms_core.auth import request_user
from tms_core.public_url import public_url

REJECTED = error_response(
    400, "The upload is REJECTED (its size or SHA-256 differ from the declaration): `detail` says why."
)


class ArtifactSerializer(serializers.ModelSerializer):
    team = serializers.IntegerField(source="team_id", read_only=True, help_text="The id of the team it belongs to.")

    class Meta:
        model = Artifact
        fields = [
            "id", "name", "team", "sha256", "size", "created_at", "status", "rejection_reason", "upload_expires_at",
        ]  # fmt: skip
        read_only_fields = fields


class UploadBeginSerializer(StrictInputMixin, serializers.Serializer):
    name = serializers.CharField(max_length=200, help_text="File name of the artifact.")
    size = serializers.IntegerField(min_value=1, help_text="Exact size in bytes of what will be sent.")
    sha256 = serializers.RegexField(
        r"^[0-9a-fA-F]{64}$", help_text="SHA-256 of the content: the upload is REJECTED unless it matches."
    )
    team = team_field("the artifact")

    def validate_size(self, value: int) -> int:
        limit = settings.TMS_ARTIFACT_MAX_BYTES
        if value > limit:
            raise serializers.ValidationError(f"Artifacts may be at most {limit} bytes.")
        return value


UploadTicketSerializer = inline_serializer(
    "ArtifactUploadTicket",
    {
        "artifact": ArtifactSerializer(),
        "upload": inline_serializer(
            "ArtifactUploadTarget",
            {
                "method": serializers.ChoiceField(["PUT", "POST"]),
                "url": serializers.URLField(),
                "fields": serializers.DictField(
                    child=serializers.CharField(), help_text="POST (S3): form fields to send before the file."
                ),
                "expires_at": serializers.DateTimeField(),
            },
        ),
    },
)


class ArtifactUploadSerializer(serializers.Serializer):
    file = serializers.FileField()
    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    team = team_field("the artifact")


class ArtifactViewSet(
    TeamOwnedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Uploaded artifacts of the requesting user's teams: stored with their SHA-256, verified
    before every run. Members read them; editors upload and delete them."""

    queryset = Artifact.objects.all()
    serializer_class = ArtifactSerializer
    parser_classes = [MultiPartParser, FormParser]

    @extend_schema(parameters=[OpenApiParameter("team", OpenApiTypes.STR, description=TEAM_FILTER_HELP)])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(request={"multipart/form-data": ArtifactUploadSerializer}, responses={201: ArtifactSerializer})
    def create(self, request: Request) -> Response:
        upload = ArtifactUploadSerializer(data=request.data, context={"request": request})
        upload.is_valid(raise_exception=True)
        given = upload.validated_data
        artifact = artifact_create(owner=request_user(request), upload=given["file"], name=given["name"],
                                   team=given.get("team"))  # fmt: skip
        return Response(ArtifactSerializer(artifact).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=UploadBeginSerializer, responses={201: UploadTicketSerializer})
    @action(detail=False, methods=["post"], url_path="uploads", parser_classes=[JSONParser])
    def uploads(self, request: Request) -> Response:
        """Start a signed upload: an UPLOADING artifact and a short-lived URL to send the bytes to
        (``PUT`` to TMS, or an S3 presigned ``POST`` when S3 storage is configured)."""
        given = UploadBeginSerializer(data=request.data, context={"request": request})
        given.is_valid(raise_exception=True)
        ticket = artifact_upload_begin(owner=request_user(request), site=public_url(request), **given.validated_data)
        upload = {"method": ticket.method, "url": ticket.url, "fields": ticket.fields, "expires_at": ticket.expires_at}
        return Response(
            {"artifact": ArtifactSerializer(ticket.artifact).data, "upload": upload}, status=status.HTTP_201_CREATED
        )

    @extend_schema(request=None, responses={200: ArtifactSerializer, 400: REJECTED, **error_responses(409)})
    @action(detail=True, methods=["post"], url_path="complete", parser_classes=[JSONParser])
    def complete(self, request: Request, pk: Any = None) -> Response:
        """After a presigned POST to S3: verify what was stored; READY (200) or REJECTED (400)."""
        artifact = artifact_upload_complete(artifact=self.get_object())
        return _verdict(artifact)

    @extend_schema(responses={204: None, **error_responses(409)})
    def destroy(self, request: Request, *args: object, **kwargs: object) -> Response:
        return super().destroy(request, *args, **kwargs)

    def perform_destroy(self, instance: Artifact) -> None:
        artifact_delete(artifact=instance)


def _verdict(artifact: Artifact) -> Response:
    data = ArtifactSerializer(artifact).data
    if artifact.status == ArtifactStatus.READY:
        return Response(data)
    # The one error shape of the API; the artifact (now REJECTED, with its reason) stays readable.
    reason = artifact.rejection_reason
    return Response(
        {"type": "upload_rejected", "detail": reason, "errors": {"file": [reason]}}, status=status.HTTP_400_BAD_REQUEST
    )


class ArtifactUploadReceiveView(APIView):
    """The signed, single-use upload URL: ``PUT`` the raw bytes. No session or token auth: the
    signature in the URL is the authority (and it lives ``TMS_ARTIFACT_UPLOAD_TTL`` seconds)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    parser_classes: list = []

    @extend_schema(
        request={"application/octet-stream": {"type": "string", "format": "binary"}},
        responses={
            200: ArtifactSerializer,
            400: REJECTED,
            **error_responses(404, 409),
        },
    )
    def put(self, request: Request, token: str) -> Response:
        stream = request.stream
        chunks = iter(lambda: stream.read(1 << 20), b"") if stream is not None else iter(())
        return _verdict(artifact_upload_receive(token=token, chunks=chunks))
