# SPDX-License-Identifier: Apache-2.0
"""A Django payment API, in one file, made idempotent by the WSGI middleware
around Django's WSGI application (in a project: in its wsgi.py).

    PYTHONPATH=clients/python/src IDEMSVC_URL=http://127.0.0.1:8080 python3 examples/python/django_app.py
    curl -i -X POST localhost:8000/payments -H 'Idempotency-Key: "order-42"' \
         -H 'Content-Type: application/json' -d '{"amount": 100}'
"""

import json
import os
import uuid

from django.conf import settings

settings.configure(DEBUG=False, ROOT_URLCONF=__name__, ALLOWED_HOSTS=["*"], SECRET_KEY=os.urandom(16).hex(),
                   MIDDLEWARE=[], USE_TZ=True)

from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import HttpRequest, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402
from django.views.decorators.http import require_POST  # noqa: E402

from idemsvc import Client  # noqa: E402
from idemsvc.wsgi import IdempotencyMiddleware  # noqa: E402


@csrf_exempt
@require_POST
def create_payment(request: HttpRequest) -> JsonResponse:
    payment = {"id": "pay_" + uuid.uuid4().hex[:12], "amount": json.loads(request.body)["amount"]}
    response = JsonResponse(payment, status=201)
    response["Location"] = "/payments/" + payment["id"]
    return response


urlpatterns = [path("payments", create_payment)]

client = Client(os.environ.get("IDEMSVC_URL", "http://127.0.0.1:8080"), os.environ.get("IDEMSVC_API_KEY"))
application = IdempotencyMiddleware(get_wsgi_application(), client)

if __name__ == "__main__":
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIServer, make_server

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    make_server("127.0.0.1", int(os.environ.get("PORT", "8000")), application, server_class=Server).serve_forever()
