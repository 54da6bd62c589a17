"""Access tokens as JWTs signed with the provider's OIDC key: issuer, the client as
audience, the user as subject, their groups, and an expiry."""

import time

from django.conf import settings
from jwcrypto import jwk, jwt


def jwt_access_token(request, refresh_token=False):  # (oauthlib's token generator signature)
    key = jwk.JWK.from_pem(settings.OAUTH2_PROVIDER["OIDC_RSA_PRIVATE_KEY"].encode())
    user = request.user
    now = int(time.time())
    claims = {"iss": settings.ISSUER, "aud": request.client_id, "sub": str(user.pk),
              "email": user.email, "groups": [g.name for g in user.groups.all()],
              "iat": now, "exp": now + settings.OAUTH2_PROVIDER["ACCESS_TOKEN_EXPIRE_SECONDS"]}
    token = jwt.JWT(header={"alg": "RS256", "kid": key.thumbprint()}, claims=claims)
    token.make_signed_token(key)
    return token.serialize()
