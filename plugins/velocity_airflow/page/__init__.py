"""The Velocity page: a FastAPI app mounted in Airflow's api-server at ``/velocity``.

Reads answer from Redis (alerts, lookups), the stream's status file (health) and the
Delta tables through delta-rs (rules, explanations): no JVM in the api-server. A rule
change goes through the versioned rule store (delta-rs) in this process, with the
``velocity_default`` connection's settings, the same validation and the same words as
`velocity rules`: it is applied in well under a second, and the stream takes it up on
its next micro-batch. Only a file that clears the state (CLEAR_STATE_ALL) runs
`velocity rules apply`, since deleting every bucket takes Spark.

An analyst's review of an alert goes to the append-only reviews table (delta-rs, in this
process too); the page shows each rule version's alerts, reviews and precision, and each
SHADOW candidate beside its rule in force (``velocity.analyst.shadow_compare``), to promote or
discard.

A preview of the add-rules form's rules (what they would have fired over the last hours
of the live events, ``velocity.delta.preview_reader``) is computed in this process too,
in a worker thread (the routes are plain functions, which FastAPI runs off the event
loop); it writes nothing, but takes both cores for seconds, so it needs the role that may
change rules and passes the write check, as a change does.

The page opens on the queue of cases (``velocity.analyst.case_queue``, the cases read through
``velocity.delta.case_store``): a case opens to its alerts, payments and history, and is
assigned, closed with a verdict (which reviews each of its alerts) or reopened here. A
backfill run is started from the page as a run of the backfill DAG, through Airflow's own
code in this process (``airflow.api.common.trigger_dag``), with the user's permissions.

A click that changes one thing (assign, close, reopen, pause, activate, delete, an
outcome; the queue's filter, orders and pages; the window lookup) is sent by the page's
script with ``X-Velocity-In-Place`` and answered with the outcome and the parts of the page
it changed, as JSON (``common.answer``, the HTML of each ``data-part``), drawn in place;
the same route answers a plain form (no script) with the redirect back to the page.

One live feed per open page (``/api/page/live``) counts what changed since the page was
drawn (alerts published, cases updated) and the page says so; rows are drawn again only
when asked. Each click's moment travels in a short-lived cookie and ``ClickTiming`` notes
when the request reached this app (``/api/clicks``), once the user is known (a request
nobody signed in to records nothing): the page's responsiveness, measured.

Airflow's authentication guards every route: the page needs a signed-in user; a change
(a rule change, a review, a case's change, a backfill) and a preview need permission to
edit the ``run_stream`` DAG (SimpleAuthManager: roles user, op and admin, not viewer),
since a rule change changes what the stream does. A post signed in by the browser's
session cookie must carry the page's token (``csrf_token``, an HMAC of the session cookie
drawn into every form and the page's meta) and come from this page (its ``Origin``), so
another site cannot post one with the user's cookie; a script posts with a bearer token
and no cookie.

The app (``app.py``) includes one router a resource; each router module sits beside the
HTML builder of its part of the page (``<resource>.py`` and ``<resource>_html.py``):
``home`` (the whole page), ``cases`` (the queue and a case), ``alerts`` (alerts, their
reviews and explanations, precision), ``rules``, ``shadow``, ``preview``, ``backfills``,
``lookups``, ``health``, ``live`` (the live feed), ``clicks``, ``check`` (try a payment:
the pre-authorization check, a read any signed-in user may run). ``access`` holds the
signed-in user, the write check and the settings; ``common`` what several routers share.

The signed-in user is the app's dependency, declared once for every route; a router of
changes declares its write check once for each of its routes (``access.EDIT_RULES``,
``access.REVIEW``, ``access.START_BACKFILL``, ``access.PREVIEW``), and the app refuses to
start with a route other than a GET without one.
"""
