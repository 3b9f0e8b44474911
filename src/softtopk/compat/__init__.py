"""Drop-in replacements with the original packages' signatures, mapped onto softtopk's API."""
