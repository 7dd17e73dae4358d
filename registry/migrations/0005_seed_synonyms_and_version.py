from django.db import migrations

# Field reports: the same parameter arrives under many names; these are the
# ones seen most. Ops extend the table in the admin.
SYNONYMS = {
    "dest_lang": ["target_lang", "target_language", "language", "to_language", "lang_to",
                  "to_lang", "tgt_lang", "dst_lang"],
    "src_lang": ["source_lang", "source_language", "from_language", "lang_from", "from_lang"],
    "text": ["content", "input_text", "query", "prompt_text"],
    "max_length": ["max_len", "length_limit", "max_words"],
}


def seed(apps, schema_editor):
    ParameterSynonym = apps.get_model("registry", "ParameterSynonym")
    RouteVersion = apps.get_model("registry", "RouteVersion")
    for canonical, synonyms in SYNONYMS.items():
        for synonym in synonyms:
            ParameterSynonym.objects.get_or_create(synonym=synonym, defaults={"canonical": canonical})
    RouteVersion.objects.get_or_create(pk=1, defaults={"version": 0})


class Migration(migrations.Migration):
    dependencies = [("registry", "0004_registry_leases_tokens")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
