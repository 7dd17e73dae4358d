"""Usage events record every outcome a call can end with: success, the client going
away, or any code of the error catalogue (reach_core.errors)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("metering", "0005_rollups_share_one_shape")]

    operations = [
        migrations.AlterField(
            model_name="usageevent",
            name="outcome",
            field=models.CharField(
                choices=[
                    ('success', 'Success'),
                    ('client_cancelled', 'Client cancelled'),
                    ('invalid_input', 'Invalid input'),
                    ('malformed_json', 'Malformed JSON'),
                    ('bad_request', 'Bad request'),
                    ('payload_too_large', 'Payload too large'),
                    ('headers_too_large', 'Headers too large'),
                    ('unauthorized', 'Unauthorized'),
                    ('forbidden', 'Forbidden'),
                    ('not_found', 'Not found'),
                    ('method_not_allowed', 'Method not allowed'),
                    ('not_acceptable', 'Not acceptable'),
                    ('conflict', 'Conflict'),
                    ('unsupported_media_type', 'Unsupported media type'),
                    ('no_capability', 'No capability'),
                    ('no_healthy_instance', 'No healthy instance'),
                    ('circuit_open', 'Circuit open'),
                    ('rate_limited', 'Rate limited'),
                    ('quota_exceeded', 'Quota exceeded'),
                    ('idempotency_in_progress', 'Idempotency key in progress'),
                    ('idempotency_key_reused', 'Idempotency key reused'),
                    ('idempotency_unavailable', 'Idempotency unavailable'),
                    ('deadline_exceeded', 'Deadline exceeded'),
                    ('upstream_timeout', 'Upstream timeout'),
                    ('upstream_error', 'Upstream error'),
                    ('upstream_bad_response', 'Upstream bad response'),
                    ('upstream_refused', 'Upstream refused'),
                    ('overloaded', 'Overloaded'),
                    ('unavailable', 'Unavailable'),
                    ('internal_error', 'Internal error'),
                ],
                max_length=32,
            ),
        ),
    ]
