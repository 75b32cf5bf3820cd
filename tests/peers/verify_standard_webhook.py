"""Verifies a Standard Webhooks signature with the reference library (PyPI
`standardwebhooks`): argv[1] the secret, stdin a JSON object {headers, body}. Exits 0 when
the signature verifies."""
import json
import sys

from standardwebhooks.webhooks import Webhook

req = json.load(sys.stdin)
Webhook(sys.argv[1]).verify(req["body"], req["headers"])
print("verified")
