"""The operator console at /console/: server-rendered pages over the same calls as the API.

Every page reads through `compute.http.envelope.call`, so it is decided by the same IAM
decision as the API method it mirrors, for the signed-in principal's tenant and role. Every
action is a call from the browser to the envelope itself (static/console/console.js), with
the session cookie and the X-Better-Compute CSRF header, so it writes the same audit row
and outbox event as the CLI.
"""
