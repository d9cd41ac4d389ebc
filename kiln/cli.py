def main(argv=None):
    print("kiln")
