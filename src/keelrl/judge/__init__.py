"""People choosing: `keelrl judge`'s blind A/B sessions (session.py), their page and server (page.html, server.py) and the votes' store (store.py)."""
