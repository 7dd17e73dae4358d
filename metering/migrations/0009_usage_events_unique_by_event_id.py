"""Usage events are unique by the gateway's own ``event_id``, not by ``request_id``.

A caller chooses its X-Request-ID; with ``request_id`` unique, twenty calls sharing
one id (or another tenant reusing it) were stored as one event, or none. Existing
rows keep their request id as their event id.
"""

from django.db import migrations, models

import metering.models


def copy_request_ids(apps, schema_editor):
    UsageEvent = apps.get_model("metering", "UsageEvent")
    UsageEvent.objects.update(event_id=models.F("request_id"))


class Migration(migrations.Migration):
    dependencies = [("metering", "0008_outcomes_for_overload_and_outages")]

    operations = [
        migrations.AddField(
            model_name="usageevent", name="event_id",
            field=models.CharField(max_length=128, null=True),
        ),
        migrations.RunPython(copy_request_ids, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="usageevent", name="event_id",
            field=models.CharField(default=metering.models.new_event_id, max_length=128,
                                   unique=True),
        ),
        migrations.AlterField(
            model_name="usageevent", name="request_id",
            field=models.CharField(db_index=True, max_length=128),
        ),
    ]
