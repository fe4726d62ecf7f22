"""What training reads: the dataset, its partition into client shards, the shards'
validation, and the pretrained base."""
