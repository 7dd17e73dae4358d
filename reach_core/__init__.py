"""The Django-free kernel both planes share.

Request ids, the key format, the endpoint policy, the error catalogue and the
kinds enums. It imports nothing else of the project and nothing of Django, so
the gateway and the router can import it without starting a web framework.
"""
