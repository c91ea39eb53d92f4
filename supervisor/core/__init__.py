"""The pure core: records in, incidents and plans out. No Ray, torch or boto3 imports here."""
