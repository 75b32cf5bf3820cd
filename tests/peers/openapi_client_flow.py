"""A short flow through a Python client that openapi-python-client generated from the served
OpenAPI document (run by tests/api/ops.rs): sign in, create a device, heartbeat, open a
session, post and query logs, create an integration. Exits non-zero on any failure; prints one
line a step."""

import os

from fleetops_client import AuthenticatedClient, Client
from fleetops_client import models as m
from fleetops_client.api.alerts import create_integration, list_integrations
from fleetops_client.api.auth import login
from fleetops_client.api.devices import create_device, heartbeat
from fleetops_client.api.logs import append_logs, query_logs
from fleetops_client.api.sessions import create_session

base = os.environ["FLEETOPS"]
anon = Client(base_url=base, raise_on_unexpected_status=True)
token = login.sync(
    client=anon, body=m.Login(email=os.environ["EMAIL"], password=os.environ["PASSWORD"])
)
assert isinstance(token, m.Token), token
print("signed in:", token.token_type)
user = AuthenticatedClient(base_url=base, token=token.access_token, raise_on_unexpected_status=True)

device = create_device.sync("default", "default", client=user, body=m.CreateDevice(name="py-robot"))
assert isinstance(device, m.DeviceView), device
print("device:", device.id, device.status)
robot = AuthenticatedClient(base_url=base, token=device.device_token, raise_on_unexpected_status=True)
ack = heartbeat.sync(
    "default", "default", device.id, client=robot,
    body=m.Heartbeat(metrics=m.HeartbeatMetrics.from_dict({"battery": 80.0})),
)
print("heartbeat:", ack.status)
session = create_session.sync("default", "default", client=robot, body=m.CreateSession(device_id=device.id))
print("session:", session.id, session.status)
accepted = append_logs.sync(
    "default", "default", session.id, client=robot,
    body=[m.RawEntry(level="error", module="motor", message="left motor overheat")],
)
print("accepted:", accepted.accepted)
page = query_logs.sync("default", "default", session.id, client=user, level="error")
print("query:", page.total, page.items[0].level, page.items[0].message)

hook = create_integration.sync(
    "default", "default", client=user,
    body=m.WebhookIntegrationRequest(
        type_=m.WebhookIntegrationRequestType.WEBHOOK,
        name="ops hook",
        config=m.WebhookIntegrationConfig(url="https://example.com/hook", signing_secret="s3cret-value-123456"),
    ),
)
print("integration:", hook.id, hook.type_)
listed = list_integrations.sync("default", "default", client=user)
print("integrations:", len(listed.items))
