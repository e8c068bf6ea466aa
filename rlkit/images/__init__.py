"""What rlkit knows about its Apptainer images without Apptainer: the pinned versions and the SIF format."""
