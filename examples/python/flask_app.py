# SPDX-License-Identifier: Apache-2.0
"""A Flask payment API made idempotent by the WSGI middleware.

    PYTHONPATH=clients/python/src IDEMSVC_URL=http://127.0.0.1:8080 python3 examples/python/flask_app.py
    curl -i -X POST localhost:5000/payments -H 'Idempotency-Key: "order-42"' \
         -H 'Content-Type: application/json' -d '{"amount": 100}'

The same request again gets the first answer, with Idempotent-Replayed: true.
"""

import os
import uuid

from flask import Flask, jsonify, request

from idemsvc import Client
from idemsvc.wsgi import IdempotencyMiddleware

app = Flask(__name__)


@app.post("/payments")
def create_payment():  # type: ignore[no-untyped-def]
    payment = {"id": "pay_" + uuid.uuid4().hex[:12], "amount": request.get_json()["amount"]}
    return jsonify(payment), 201, {"Location": "/payments/" + payment["id"]}


client = Client(os.environ.get("IDEMSVC_URL", "http://127.0.0.1:8080"), os.environ.get("IDEMSVC_API_KEY"))
app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, client)  # type: ignore[method-assign]

if __name__ == "__main__":
    app.run(port=int(os.environ.get("PORT", "5000")), threaded=True)
