/* A program for the pinshim command's tests to run: built dynamic, static and
 * copied setuid. It prints a marker, so a test sees that it ran, and exits with
 * the status given as its argument. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    printf("cli_target ran\n");
    return argc > 1 ? atoi(argv[1]) : 0;
}
