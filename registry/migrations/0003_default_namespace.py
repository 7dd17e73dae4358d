from django.db import migrations


def create_default(apps, schema_editor):
    Namespace = apps.get_model("registry", "Namespace")
    Namespace.objects.get_or_create(
        name="default", defaults={"description": "Where agents land when no namespace is named."}
    )


class Migration(migrations.Migration):
    dependencies = [("registry", "0002_initial")]

    operations = [migrations.RunPython(create_default, migrations.RunPython.noop)]
