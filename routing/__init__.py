"""The router: plain Python over an immutable RouteTable. No Django imports here."""
